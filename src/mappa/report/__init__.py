"""What a run reports: one metrics vocabulary (``metrics``), the end-of-run summary, the
DSBench report, and ``mappa report``'s static HTML report of runs (``html``; docs/report.md)."""
