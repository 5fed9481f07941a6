"""tools/client.py: the status an error event inside a stream stands for."""

from tpserve.tools.client import stream_error_status


def test_stream_error_status_from_code_or_type():
    assert stream_error_status({"code": 503, "type": "X"}) == 503  # servers that send an integer code
    assert stream_error_status({"code": None, "type": "ServiceUnavailableError"}) == 503  # OpenAI's shape
    assert stream_error_status({"code": "invalid_api_key", "type": "BadRequestError"}) == 400
    assert stream_error_status({"code": True, "type": "InternalServerError"}) == 500
    assert stream_error_status({}) == 500
    assert stream_error_status("not a dict") == 500
