"""`sempar demo`'s stages: every stage sempar has, run on the default data into one report
(`run.run_demo`); the CLI verb is `sempar.commands.demo`."""
