"""What the extender and the node agent share: the object and annotation contract, typed values,
parsing of pods and tidelease objects, errors, logging and the command line."""
