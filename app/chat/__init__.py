"""Chat formats: what a model's own chat template makes of reasoning and tool calls. Which format a
template speaks (`detect`), one small module per format (parse, grammar), the reasoning split
(`reasoning`), argument types from the tool's JSON schema (`types`), GBNF helpers (`gbnf`) and the
incremental parser that turns a streamed answer into typed deltas (`stream`).

Pure text: no model, no server. May import: app.errors.
"""
