"""Language servers (LSP) for the API's LSP group and the model's tools: their catalog
(catalog.py), the base protocol (framing.py) and JSON-RPC over a contained process
(connection.py), one server's client (client.py), the server's set of them (servers.py), and
what the model's tools take from them (for_model.py)."""
