"""No credential in params (issue 47, M3): params are published (dvc.lock, MLflow params,
resolved_params.yaml, log lines), so a Beam option or a tracking URI carrying one is
refused when params are read, in one line that names the key and never shows the secret."""

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from tfmlops.config import ConfigError, config_from_dict

SECRET = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYzEXAMPLE"

# Options that carry a credential: Beam's S3 keys and Azure's connection string, and
# other runners' pass-through spellings of a password, token or secret.
CREDENTIAL_OPTIONS = ["s3_access_key_id", "s3_secret_access_key", "s3_session_token",
                      "azure_connection_string", "db_password", "api_token", "client_secret",
                      "awsCredentialsProvider", "private_key", "storage_account_key"]
# Beam options that carry none (the defaults, endpoints, key *files*, names of keys).
SAFE_OPTIONS = ["--runner=DirectRunner", "--direct_running_mode=multi_processing",
                "--direct_num_workers=0", "--s3_region_name=eu-west-1",
                "--s3_endpoint_url=http://127.0.0.1:9000", "--s3_verify=/etc/ssl/ca.pem",
                "--project=my-project", "--temp_location=gs://bucket/tmp", "--no_auth",
                "--dataflow_kms_key=projects/p/locations/l/keyRings/r/cryptoKeys/k",
                "--service_account_email=sa@p.iam.gserviceaccount.com",
                "--service_account_key_file=/keys/secret-sa.json", "--enable_hot_key_logging",
                "--job_endpoint=localhost:8099", "--environment_config=localhost:50000",
                "--extra_package=dist/tfmlops-0.1.0-py3-none-any.whl"]


def beam_options(options) -> dict:
    return {"data": {"engine": "beam", "beam": {"options": options}}}


def refusal(raw: dict) -> str:
    with pytest.raises(ConfigError) as err:
        config_from_dict(raw)
    message = str(err.value)
    assert SECRET not in message and len(message.splitlines()) == 1, message
    return message


@settings(max_examples=120, deadline=None)
@given(name=st.sampled_from(CREDENTIAL_OPTIONS), dashes=st.booleans(), upper=st.booleans(),
       form=st.sampled_from(["--{n}={s}", "--{n} {s}", " --{n} = {s}", "--{n}:{s}", "--{n}={s}=",
                             "two items", "no value"]),
       before=st.lists(st.sampled_from(SAFE_OPTIONS), max_size=3),
       after=st.lists(st.sampled_from(SAFE_OPTIONS), max_size=3))
def test_a_credential_option_is_refused_naming_it_without_its_value(name, dashes, upper, form,
                                                                     before, after):
    spelled = name.replace("_", "-") if dashes else name
    spelled = spelled.upper() if upper else spelled
    items = {"two items": [f"--{spelled}", SECRET], "no value": [f"--{spelled}"]}.get(
        form, [form.format(n=spelled, s=SECRET)])
    message = refusal(beam_options([*before, *items, *after]))
    assert message.startswith(f"data.beam.options[{len(before)}]: --{spelled} carries a "
                              "credential"), message
    assert "dvc.lock" in message
    env = "AZURE_STORAGE_CONNECTION_STRING" if name.startswith("azure") else "AWS_PROFILE"
    assert env in message, message


@settings(max_examples=60, deadline=None)
@given(options=st.lists(st.sampled_from(SAFE_OPTIONS), min_size=1, max_size=6))
def test_options_without_a_credential_pass(options):
    assert config_from_dict(beam_options(options)).data.beam.options == options


@pytest.mark.parametrize("options, index, name", [
    ([f"--s3_endpoint_url=https://AKIAEXAMPLE:{SECRET}@minio.internal:9000"], 0,
     "--s3_endpoint_url"),
    (["--runner=PortableRunner", "--job_endpoint", f"http://u:{SECRET}@jobs:8099"], 1,
     "--job_endpoint"),
    ([f"--temp_location=https://store/tmp?token={SECRET}"], 0, "--temp_location"),
    ([f'--environment_config={{"env": {{"AWS_SECRET_ACCESS_KEY": "{SECRET}"}}}}'], 0,
     "--environment_config"),
    (["--service_account_key_file", f"-----BEGIN PRIVATE KEY-----{SECRET}"], 0,
     "--service_account_key_file"),  # a key file's content, not its path
])
def test_a_credential_in_an_options_value_is_refused(options, index, name):
    message = refusal(beam_options(options))
    assert message.startswith(f"data.beam.options[{index}]: {name} has a credential in its "
                              "value"), message


def test_a_credential_in_an_item_of_its_own_is_refused():
    """No option before it: it is refused by its place (after a flag, as the flag's value)."""
    message = refusal(beam_options([f"https://u:{SECRET}@store.internal/", "--no_auth"]))
    assert message.startswith("data.beam.options[0] has a credential in it"), message


@pytest.mark.parametrize("raw", [
    {"data": {"beam": {"options": f"--s3_secret_access_key={SECRET}"}}},  # not a list
    {"data": {"beam": {"options": ["--runner=DirectRunner", {"key": SECRET}]}}},
    {"tracking": {"uri": [f"http://alice:{SECRET}@mlflow:5000"]}},
])
def test_a_refused_type_does_not_show_a_value_that_may_be_a_secret(raw):
    assert "not shown" in refusal(raw)


@pytest.mark.parametrize("uri", [f"http://alice:{SECRET}@mlflow.internal:5000",
                                 f"postgresql://mlflow:{SECRET}@db.internal/mlflow",
                                 f"https://mlflow.internal/?token={SECRET}"])
def test_a_password_in_tracking_uri_is_refused(uri):
    message = refusal({"tracking": {"uri": uri}})
    assert message.startswith("tracking.uri holds a password or token") and \
        "MLFLOW_TRACKING_URI" in message, message
    config_from_dict({"tracking": {"uri": "http://alice@mlflow.internal:5000"}})  # a user alone


def test_check_exits_2_in_one_line_without_the_secret(tmp_path, capsys):
    from tfmlops.cli import main

    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(beam_options(["--runner=DirectRunner",
                                                   "--s3_secret_access_key", SECRET])))
    assert main(["--params", str(params), "check"]) == 2
    captured = capsys.readouterr()
    (line,) = captured.err.strip().splitlines()
    assert "data.beam.options[1]: --s3_secret_access_key carries a credential" in line
    assert SECRET not in captured.out + captured.err
