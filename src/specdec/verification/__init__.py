"""Verification: pure functions of target logits/probabilities and a draft. No model code here.

Terminology follows vLLM's rejection sampler: accepted tokens are draft tokens the target keeps; at the
first rejection a recovered token is drawn from the residual distribution; if every draft token is
accepted a bonus token is drawn from the target's next distribution. Either way a step ends with
exactly one token that did not come from the draft (`next_token`). Tree drafts (tree.py) keep one
root-to-node path of the tree (`path`).
"""

from specdec.verification.greedy import verify_greedy
from specdec.verification.probabilities import sampling_probs, sample
from specdec.verification.result import Verification
from specdec.verification.sampling import verify_sampling
from specdec.verification.tree import verify_tree_greedy, verify_tree_sampling
from specdec.verification.verify_draft import TargetRows, verify

__all__ = [
    "TargetRows",
    "Verification",
    "sample",
    "sampling_probs",
    "verify_greedy",
    "verify_sampling",
    "verify_tree_greedy",
    "verify_tree_sampling",
    "verify",
]
