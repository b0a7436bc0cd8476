"""k26-console: a full-screen terminal console for SGLang inference servers."""

import warnings

# asyncssh 2.24 names cryptography's DSA classes when it is imported, and cryptography 51 warns about each
# name: five warnings on the stderr of every command, before its one sentence. No key here is DSA.
warnings.filterwarnings("ignore", message=r"DSA is deprecated", module=r"asyncssh(\.|$)")
