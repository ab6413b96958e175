"""Benchmarking an agent at writing training jobs: N episodes per task, means with error bars.

    runner.py   run_eval: episodes concurrently, resumable, within a budget (OUT/runs/, OUT/results.json)
    stats.py    mean and two standard errors per task and overall (infra errors counted apart)
    compare.py  two evals: per-task differences with their noise
    report.py   an offline HTML page with the table and plots
    types.py    EvalPlan, EpisodeRow, Stat, Summary, EvalResults

`ait eval` is the command; the outer loop's held-out evaluation summarizes its episodes with
the same statistics.
"""
