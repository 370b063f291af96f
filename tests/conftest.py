import os
import sys

# The project is three top-level modules; make them importable without installing.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
