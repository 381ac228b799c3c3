"""The agent loop: agent.py runs a generation (call the model, run the calls it makes, repeat)
through tool_gate.py (permission rules, confirmation, lanes) and tool_runner.py; context.py counts
and compacts the context, repair.py answers the calls a crash left open, budget.py caps a
session's tokens, structured.py checks a JSON answer against its schema (structured_answer.py
asks one such question outside the conversation: planning.py's plans and goals, judged with
work_facts.py's account of a session's work), chunks.py and
accounting.py are what the log keeps of a generation, and host.py is what the loop needs from the
server around it (the Runtime implements it).
"""
