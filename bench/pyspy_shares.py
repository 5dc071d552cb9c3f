"""py-spy raw (collapsed) stacks: the share of samples whose stack has a frame containing each given substring,
and the top leaf frames.   python3 bench/pyspy_shares.py PROFILE.raw PATTERN [PATTERN ...]"""
import sys, collections
path = sys.argv[1]; pats = sys.argv[2:]
tot = 0; inc = collections.Counter(); top = collections.Counter()
for line in open(path):
    stack, _, n = line.rstrip().rpartition(" ")
    n = int(n); tot += n
    frames = stack.split(";")
    seen = set()
    for p in pats:
        if any(p in f for f in frames): inc[p] += n
    # leaf-ish: the first kb_assets / dagster frame from the bottom
    top[frames[-1].split(" (")[0]] += n
print("total samples", tot)
for p in pats: print(f"{inc[p]/tot*100:5.1f}%  {p}")
print("-- top leaves")
for f, n in top.most_common(15): print(f"{n/tot*100:5.1f}%  {f}")
