"""`posenc leaderboard`: the benchmark protocol as data (protocol.py: its arms, seeds, metrics and how
far each value may move between CPUs; posenc-pe-v*.yaml), the shipped baselines measured with it
(data.py, baselines/<protocol>.json; carry.py: a version that runs the same arms keeps the rows),
each row's `posenc check` record (checked.py), a re-run judged against the shipped values (match.py),
a new row placed among them with `posenc compare`'s statistics (place.py), and the leaderboard page
generated from the data (page.py). The command itself is posenc/cli/leaderboard*.py."""
