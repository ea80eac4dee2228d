from memtier.cli import main

raise SystemExit(main())
