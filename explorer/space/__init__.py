"""Search spaces: parameter domains and the conditional structure of the tuning knobs."""

from explorer.space._domain import Categorical, Domain, Fixed, Ordered, parse_domain
from explorer.space._space import SearchSpace, facts_of, parameter_domain

__all__ = [
    "Categorical",
    "Domain",
    "Fixed",
    "Ordered",
    "SearchSpace",
    "facts_of",
    "parameter_domain",
    "parse_domain",
]
