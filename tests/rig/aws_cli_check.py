#!/usr/bin/env python3
"""Checks AWS CLI command lines without sending them: each line of standard input is one command
(`aws SERVICE OPERATION ARGS...`, shell words). The AWS CLI itself parses it (its own argument
parser, `file://` parameters read from the working directory), then, just before the request
would be built, this hook checks the parameters against botocore's service model (the types,
required members and lengths botocore checks, and the enums it leaves to the service) and stops
the call. Prints one JSON object a line: {"command", "operation", "params"} or {"command",
"error"}. Used by tests/docs.rs."""

import json
import os
import shlex
import sys

from awscli.clidriver import create_clidriver
from botocore.validate import ParamValidator


class Checked(BaseException):  # not Exception: the CLI would catch that and print it
    pass


def enum_errors(shape, value, path):
    if shape is None:
        return []
    if getattr(shape, "enum", None) and value not in shape.enum:
        return [f"{path}: {value!r} is not one of {shape.enum}"]
    if shape.type_name == "structure" and isinstance(value, dict):
        return [e for k, v in value.items() for e in enum_errors(shape.members.get(k), v, f"{path}.{k}")]
    if shape.type_name == "list" and isinstance(value, list):
        return [e for i, v in enumerate(value) for e in enum_errors(shape.member, v, f"{path}[{i}]")]
    return []


def main():
    # Never sent: the region and keys only let the CLI reach the point where it would be.
    os.environ.setdefault("AWS_DEFAULT_REGION", "eu-west-1")
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "checked-not-sent")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "checked-not-sent")
    for line in sys.stdin:
        words = shlex.split(line)
        if not words:
            continue
        assert words[0] == "aws", line
        result = {"command": line.strip()}

        def check(params, model, **_):
            report = ParamValidator().validate(params, model.input_shape)
            errors = [report.generate_report()] if report.has_errors() else []
            errors += enum_errors(model.input_shape, params, model.name)
            raise Checked(json.dumps({"operation": model.name, "params": params,
                                      "errors": errors}))

        driver = create_clidriver()
        driver.session.register("provide-client-params", check)
        try:
            status = driver.main(words[1:])
            result["error"] = f"the CLI exited {status} before any request"
        except Checked as checked:
            found = json.loads(str(checked))
            result["operation"] = found["operation"]
            result["params"] = found["params"]
            if found["errors"]:
                result["error"] = "; ".join(found["errors"])
        except SystemExit as exit_:
            result["error"] = f"the CLI refused the arguments (exit {exit_.code})"
        except Exception as error:  # noqa: BLE001 (the CLI's own refusals)
            result["error"] = f"{type(error).__name__}: {error}"
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
