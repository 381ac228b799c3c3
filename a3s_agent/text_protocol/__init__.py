"""The CodingAgent text protocol: tools as command blocks for models without function calling.

- commands.py: the commands ([CREATE_FILE], [EDIT_FILE]... [DONE]), parse errors, path checks
- parser.py: a model's reply to commands and parse errors
- renderer.py: commands as text, the PROTOCOL instructions, command results, the outbox document
- tag_mode.py: the tag tool mode provider (`openai+text`): commands as tool calls, results as text
- relay.py: the relay provider (`relay`): each turn an outbox file a person answers through the inbox

The providers are built by llm/factory.py when an LLM config asks for them; nothing here loads
otherwise. EDIT_FILE runs the built-in edit_lines tool (tools/line_edits.py).
"""
