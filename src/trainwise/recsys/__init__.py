"""Recommenders: a shop's behaviour log in, an honest offline evaluation out.

One room for one concept, because a recommender's data, models and evaluation only make sense together:
generator.py (a synthetic shop log with a known answer), sequences.py (histories, training windows, click
pairs, held-out queries), data.py (the `shop` data builder: synthetic or `trainwise prepare`d logs),
models.py (SASRec, GRU4Rec, popularity, DIN), sampled.py (sampled softmax for large catalogues), ranking.py
(full-ranking metrics, in chunks), recommend.py (`trainwise recommend`). Training goes through the ordinary
Trainer: the batches are `(inputs, targets)` tensors and the trainer's default cross-entropy is the right loss
for both objectives (see models.py), except under `model.args.loss=sampled`, where the model brings its own
(`training_loss`, which the train step uses).
The recipes `shop-sasrec` and `shop-din` name the builders registered in recipes/.
"""
