from solution import to_snake_case


def test_camel_and_pascal_case():
    assert to_snake_case("camelCase") == "camel_case"
    assert to_snake_case("PascalCaseName") == "pascal_case_name"


def test_acronyms():
    assert to_snake_case("HTTPServer") == "http_server"
    assert to_snake_case("getHTTPResponseCode") == "get_http_response_code"


def test_digits_before_capitals():
    assert to_snake_case("version2Beta") == "version2_beta"


def test_separators_collapse_and_are_trimmed():
    assert to_snake_case("Hello World") == "hello_world"
    assert to_snake_case("  Leading-and  trailing__ ") == "leading_and_trailing"


def test_already_snake_case_is_unchanged():
    assert to_snake_case("already_snake") == "already_snake"
