"""What a run reports: one metrics vocabulary (``metrics``) and the DSBench report."""
