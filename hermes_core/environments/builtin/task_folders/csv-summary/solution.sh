#!/bin/bash
# Reference solution: create sales.csv as told, then summarise it.
cat > sales.csv <<'CSV'
region,product,units,unit_price
north,widget,10,2.50
south,gadget,3,10.00
north,gadget,1,10.00
east,widget,4,2.50
south,widget,8,2.50
east,gizmo,2,7.25
west,gizmo,5,7.25
north,gizmo,2,7.25
CSV
{
    echo "region,units,revenue"
    awk -F, 'NR > 1 { units[$1] += $3; revenue[$1] += $3 * $4 }
             END { for (r in units) printf "%s,%d,%.2f\n", r, units[r], revenue[r] }' sales.csv \
        | LC_ALL=C sort -t, -k3,3nr -k1,1
} > summary.csv
