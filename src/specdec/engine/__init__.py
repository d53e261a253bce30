"""The generation loop: propose -> verify -> commit, stop conditions, statistics."""
