"""Reading and writing the artifacts of a run, one module per artifact (docs/architecture.md):
the stages write and read them only through here, never through another stage."""
