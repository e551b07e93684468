"""In-process restarts on the agent's side: the control socket the workers under
``elastic.inprocess`` connect to (``host``), the keeper that parks and resumes them (``keeper``),
and the wire both ends import (``wire``; the worker's side imports it too: the standard library
only, nothing else here is imported with it)."""
