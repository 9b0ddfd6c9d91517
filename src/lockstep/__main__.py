from lockstep.cli import main

raise SystemExit(main())
