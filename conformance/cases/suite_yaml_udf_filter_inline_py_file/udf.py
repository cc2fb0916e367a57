
def f(x):
  return x.row.rank > 0

def g(x):
  return x.row.rank > 1
