"""The browser dashboard: sign-in, launch forms, live job pages, replay, compare and exports."""
