"""Search spaces: parameter domains and the conditional structure of the tuning knobs."""

from explorer.space._domain import Categorical, Domain, Fixed, Ordered, parse_domain
from explorer.space._space import PARAMETERS, SearchSpace

__all__ = ["PARAMETERS", "Categorical", "Domain", "Fixed", "Ordered", "SearchSpace", "parse_domain"]
