"""The compiler: manifest + spec -> bound tensors (`bind`), parts and their graph (`graph`,
`split`), runs and steps (`schedule`), one `Plan` (`compile`), and the plan cache (`plancache`).
"""
