"""The live event stream: publishing a job's progress, and the websockets that follow it."""
