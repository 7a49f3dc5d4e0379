"""What every engine's rules share, so an engine package holds only what it alone knows.

bottleneck.py  `Table`: an engine's bottleneck rules in priority order, every engine's first
               rows (client-bound, held apart, KV full) and the walk; the window's usage
checks.py      `Check`: one launch argument's safety and usefulness halves; `Observed`; the
               table of checks by name, an unknown argument refused
verdicts.py    `Verdicts`: `evaluate` and `judge` over an engine's checks
rules.py       `ServerRules` and its `Parts`: assess and judge for one server
proposals.py   the client-bound proposal every engine makes, and the walk of a proposal table
engine.py      `EngineBase` (a read-only engine's defaults) and `TunedEngine` (the members a
               tuned engine's modules answer), its clients' `EngineReader`, `ConnectOptions`
"""
