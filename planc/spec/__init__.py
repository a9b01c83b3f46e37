"""The placement spec: its models (`model`) and its hostile-input YAML/JSON reader (`parse`).
"""
