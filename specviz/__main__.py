from specviz.cli import main

raise SystemExit(main())
