"""The sweep: many trials as one experiment: configs (hydra), planning, launching, resume, tracking (mlflow).

It turns a composed config into engine calls and records what they measured.
"""

import warnings

# conf/hydra/launcher/{joblib,ray,submitit_*}.yaml carry the project's settings under the
# plugins' own names, so Hydra merges each onto the plugin's schema of that name (as it still
# does in hydra-core 1.3) and warns that this is deprecated: the merge is what we want.
warnings.filterwarnings("ignore", message=r"(?s).*is validated against ConfigStore schema with the same name")
