"""Skills: skill.py reads one (a SKILL.md's frontmatter and instructions; frontmatter.py holds its
fields as pydantic models, a3s_code_backends.py A3S Code's tool backends in our terms), and
catalog.py knows which skills exist and which each session has loaded.
"""
