"""The ways in: each face converts its wire format to core calls and maps errors back."""
