"""`gradian doctor`: what to paste into an issue."""
import typer
def register(app: typer.Typer) -> None:
    pass
