"""The MCP client: tools, resources and prompts from MCP servers (the official `mcp` SDK).

config.py reads the `{"mcpServers": ...}` shape; stdio.py and http.py are the transports (a stdio
server is a contained tool process); connection.py is one server, connected lazily with every wait
bounded; tools.py turns its tools into ours, results.py its results; clients.py holds every
connection of the server. Which servers a session uses is the runtime's to say (runtime/mcp.py).
"""
