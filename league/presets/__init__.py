"""The league's presets, one YAML file each (`ludus config list`; league/config.py loads them).

Each file opens with a few comment lines: what it trains, the figure it reached, the doc to read
(docs/results.md keeps the experiment history behind each). Data only: nothing here imports.
"""
