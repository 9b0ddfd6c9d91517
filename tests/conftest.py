"""Root of the test tree: pytest puts this directory on sys.path, so shared helpers such as
`teardown_abort` import by name from every test directory."""
