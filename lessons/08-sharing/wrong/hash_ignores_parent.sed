# expect: ignores the parent
# A block is keyed by its own tokens only: the same tokens after two different prefixes look like
# one block, though K and V depend on every earlier token.
s|BlockKey{parent, model, |BlockKey{/* the mistake: */ 0 * parent, model, |
