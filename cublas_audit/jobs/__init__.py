"""Each command's whole job, over the stages: measure (run) and judge, then render (report).
The CLI and the Python API call these; the run stage never picks a report writer, and reports
never judge."""
