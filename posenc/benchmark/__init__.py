"""`posenc benchmark`: a named, versioned protocol (protocol.py), the shipped baselines measured with
it (data.py, baselines/<protocol>.json), running it for one encoding (run.py), placing a new row
among the shipped ones with the statistics `posenc compare` uses (place.py), and the leaderboard
page generated from the data (leaderboard.py)."""
