from specviz.cli.main import main

raise SystemExit(main())
