"""The plan: its records (`records`), its file codec (`codec`) and checks (`check`), the admission
replay (`admission`, `node`), the cost model (`costs`), `predict` and `explain`.
"""
