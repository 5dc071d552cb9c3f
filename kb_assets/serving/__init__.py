"""Where agents and people reach kb: the MCP server (`kb mcp`, `/mcp`) and the HTTP service (`kb serve`)."""
