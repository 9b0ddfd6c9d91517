from lockstep.cli import console

raise SystemExit(console())
