# expect: ignores the model identity
# The block key is the parent and the tokens, as if the pool only ever served one model
# (proofs/planted.h: hash_ignores_model): another model's request with the same tokens maps rows it
# did not compute.
s|BlockKey{parent, model, |BlockKey{parent, /* the mistake: */ 0 * model, |
