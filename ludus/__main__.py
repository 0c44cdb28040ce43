from ludus.cli import main

raise SystemExit(main())
