//go:build tools

// Package tools lists the commands hack/build-binaries.sh builds, so that `go mod tidy` keeps
// their dependencies. It is never compiled.
package tools

import (
	_ "sigs.k8s.io/kueue/cmd/kueue"
)
