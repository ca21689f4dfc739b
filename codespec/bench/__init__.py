"""`codespec bench`: workloads built from real code, systems run side by side in one run."""
