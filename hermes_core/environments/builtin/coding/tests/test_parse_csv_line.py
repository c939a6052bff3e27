from solution import parse_csv_line


def test_plain_fields():
    assert parse_csv_line("a,b,c") == ["a", "b", "c"]


def test_quoted_field_may_hold_commas():
    assert parse_csv_line('a,"b,c",d') == ["a", "b,c", "d"]


def test_doubled_quotes_inside_quotes():
    assert parse_csv_line('"say ""hi""",x') == ['say "hi"', "x"]


def test_empty_fields():
    assert parse_csv_line("a,,b") == ["a", "", "b"]
    assert parse_csv_line("a,") == ["a", ""]
    assert parse_csv_line("") == [""]


def test_unquoted_fields_keep_their_spaces():
    assert parse_csv_line(" a , b") == [" a ", " b"]
