from solution import group_anagrams


def test_groups_in_order_of_first_appearance():
    words = ["eat", "tea", "tan", "ate", "nat", "bat"]
    assert group_anagrams(words) == [["eat", "tea", "ate"], ["tan", "nat"], ["bat"]]


def test_empty_input():
    assert group_anagrams([]) == []


def test_case_sensitive_and_duplicates_kept():
    assert group_anagrams(["ab", "Ba", "ba", "ab"]) == [["ab", "ba", "ab"], ["Ba"]]


def test_letter_counts_matter():
    assert group_anagrams(["aab", "abb", "bab"]) == [["aab"], ["abb", "bab"]]
