"""What a run leaves on disk, and the one way to read it back: its directory's layout, owned by one
class (``rundir.RunDir``; a sweep's: ``sweepdir``), directory names and atomic writes (``directory``),
its state files (``statefile``: safetensors, no pickle), their conversion from old pickles
(``convert``), where its encoding's code came from (``provenance``, ``imports``), the metrics it
records, declared once (``metrics``), and the one interface that writes them to metrics.jsonl and
W&B (``tracking``)."""
