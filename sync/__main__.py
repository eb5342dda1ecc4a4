from sync.cli import main

raise SystemExit(main())
