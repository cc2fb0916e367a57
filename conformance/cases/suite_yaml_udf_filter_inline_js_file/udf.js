
function f(x) {
  return x.row.rank > 0
}

function g(x) {
  return x.row.rank > 1
}
