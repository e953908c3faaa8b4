"""No credential in params (`data.beam.options`, `tracking.uri`): params are published.

Every params value prepare depends on is written into `dvc.lock` (git), the prepare run's
MLflow params, `models/train/resolved_params.yaml` (a DVC output, pushed) and log lines,
and no redaction reaches `dvc.lock`. So an option that carries a secret is refused when
params are read, in one line that names the option, never its value, and says where the
credential goes instead: the environment or profile the store's own client reads (Beam's
S3 filesystem builds a boto3 session with no keys when its options give none, which reads
AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN or AWS_PROFILE).

A path to a key file (an option whose name ends in `file` or `path`) passes: the path is
not the secret, the file stays on the machine. A tracking server's password goes into
MLFLOW_TRACKING_URI (which wins over `tracking.uri`) or MLflow's MLFLOW_TRACKING_USERNAME /
MLFLOW_TRACKING_PASSWORD, never into params.yaml.
"""

from __future__ import annotations

import re

# Keys whose refused value is never shown (messages.one_line), even when params give it
# the wrong type: a string there may be a secret.
SECRET_BEARING = (("data", "beam", "options"), ("data", "beam", "staging"), ("tracking", "uri"))

# Words of an option's name, compared without case, "-" or "_" (`--s3-secret-access-key`,
# `--awsCredentialsProvider`): Beam's S3 keys, Azure's connection string, and the usual
# spellings of a password, token or key for other runners' pass-through options.
_NAME_WORDS = ("secret", "password", "passwd", "token", "credential", "accesskey", "apikey",
               "privatekey", "accountkey", "connectionstring")
_PATH_ENDINGS = ("file", "path")
# In a value: a URL with `user:password@`, a secret query parameter, `NAME=`/`NAME:` with
# a credential word (an environment or JSON passed through to workers), a PEM key.
_IN_URL = (r"(?i)[a-z][a-z0-9+.-]*://[^\s/@]*:[^\s]*@"
           r"|[?&;](password|passwd|pwd|secret|token|access_token|api_key|sslpassword|sig"
           r"|x-amz-signature|x-amz-security-token)=")
_URL = re.compile(_IN_URL)
_VALUE = re.compile(_IN_URL + r"|(?i:(secret|password|passwd|token|credential|access_?key"
                    r"|api_?key)\w*[\"']?\s*[=:])|PRIVATE KEY-----")

_INSTEAD = {
    "s3": "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN in the environment, "
          "or AWS_PROFILE (~/.aws/credentials)",
    # Beam's Azure filesystem reads the variable when the option is unset
    "azure": "AZURE_STORAGE_CONNECTION_STRING in the environment",
}
_REMEDY = ("params are published (dvc.lock, the prepare run's MLflow params, "
           "resolved_params.yaml, logs): remove it and give the credential through ")
_ELSEWHERE = ("the environment the store's client reads (AWS_ACCESS_KEY_ID, "
              "AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN or AWS_PROFILE for S3; "
              "GOOGLE_APPLICATION_CREDENTIALS for Google Cloud)")


# `--name` (only the characters a name has: a typo's separator starts the value), then
# whatever the item holds after it
_NAME = re.compile(r"\s*(--?[A-Za-z0-9][\w.-]*)")


def credential_problem(options: list[str]) -> str | None:
    """Why `options` (Beam's pipeline options, as params give them) must not be
    published, naming the option (never its value) and where its credential goes
    instead; None if fine. Spellings: `--name=value`, `--name value` in one item, and
    `--name` followed by its value as the next item."""
    for i, token in enumerate(options):
        m = _NAME.match(token)
        if m is None:  # a value: its option (the item before) was checked with it
            if _VALUE.search(token):
                return f"{{p}}options[{i}] has a credential in it; {_REMEDY}{_ELSEWHERE}"
            continue
        name, rest = m.group(1), token[m.end():].strip()
        after = options[i + 1] if i + 1 < len(options) else ""
        value = rest.lstrip("=") if rest else "" if _NAME.match(after) else after
        squashed = re.sub(r"[-_]", "", name).lower()
        if any(w in squashed for w in _NAME_WORDS) and not squashed.endswith(_PATH_ENDINGS):
            what = "carries a credential"
        elif _VALUE.search(value):
            what = "has a credential in its value"
        else:
            continue
        instead = next((v for k, v in _INSTEAD.items() if squashed.startswith(k)), _ELSEWHERE)
        return f"{{p}}options[{i}]: {name} {what}; {_REMEDY}{instead}"
    return None


def url_problem(url: str) -> str | None:
    """Why a store's URL in params (`data.beam.staging`) must not hold what it holds (a
    `user:password@` or a secret query parameter), never showing it; None if fine."""
    if not _URL.search(url):
        return None
    return f"holds a password or token; {_REMEDY}{_ELSEWHERE}"


def uri_problem(uri: str) -> str | None:
    """Why `tracking.uri` must not hold what it holds (a password or token); None if fine."""
    if not _URL.search(uri):
        return None
    return ("{p}uri holds a password or token, and params are published (MLflow params, "
            "resolved_params.yaml); give the URI without it and the full one through "
            "MLFLOW_TRACKING_URI, which wins (or MLFLOW_TRACKING_USERNAME and "
            "MLFLOW_TRACKING_PASSWORD)")
