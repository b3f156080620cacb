"""The chart as an archive to install from (hack/package-chart.sh): `helm package` with the chart's
README, whose values table hack/chart-readme.py generates from values.schema.json and values.yaml
(the committed file is what it writes: the table cannot drift), and the archive installs the same
objects as the chart's directory."""

from __future__ import annotations

import subprocess
import tarfile
from pathlib import Path

import yaml

from tests.chart import CHART, ROOT, helm, kube_version


def test_the_readme_is_generated_from_the_schema_and_values() -> None:
    done = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "python"), "hack/chart-readme.py", "--check"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    readme = (CHART / "README.md").read_text()
    schema = yaml.safe_load((CHART / "values.schema.json").read_text())
    for key in schema["properties"]:  # every top-level value is in the table
        assert f"| `{key}" in readme, key
    assert "| `extender.antiAffinity` | required | preferred | none |" not in readme  # escaped
    assert '| `extender.antiAffinity` | required \\| preferred \\| none | `"required"` |' in readme


def test_the_package_holds_the_chart_and_installs_the_same(tmp_path: Path) -> None:
    done = subprocess.run(
        ["hack/package-chart.sh", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
        check=True, timeout=300,
    )  # fmt: skip
    archive = Path(done.stdout.strip().splitlines()[-1])
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]
    assert archive == tmp_path / f"tidelease-{version}.tgz"
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
        readme = tar.extractfile("tidelease/README.md")
        assert readme is not None
        assert readme.read().decode() == (CHART / "README.md").read_text()
    for name in ("Chart.yaml", "values.yaml", "values.schema.json", "templates/NOTES.txt",
                 "crds/gpunodes.yaml", "dashboards/tidelease-gpus.json"):  # fmt: skip
        assert f"tidelease/{name}" in names, name

    def objects(chart: Path) -> list[str]:
        out = helm("template", "t", str(chart), "--kube-version", kube_version()).stdout
        return sorted(f"{d['kind']}/{d['metadata']['name']}" for d in yaml.safe_load_all(out) if d)

    assert objects(archive) == objects(CHART)
