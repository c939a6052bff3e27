#!/bin/bash
# Reference solution: the fixed sum.sh (what a model should leave behind).
cat > sum.sh <<'SCRIPT'
#!/bin/bash
# Prints the sum of the integers in the file given as the first argument.
total=0
while IFS= read -r line || [ -n "$line" ]; do
  line="${line//[[:space:]]/}"
  [ -z "$line" ] && continue
  total=$(( total + line ))
done < "$1"
echo "Total: $total"
SCRIPT
chmod +x sum.sh
