"""Wire types shared by the head, the agents, the client and the CLI."""
